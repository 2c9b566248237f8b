"""Build hook: compile the farm's protocol (rpc_tracker/proto/farm.proto) with grpcio-tools.

The generated modules are not committed; every install (regular or editable) regenerates them
next to the .proto, so the Python code always matches the protocol in the repository and the
grpcio/protobuf runtime pinned in pyproject.toml. grpcio-tools is a build requirement only: the
device agent's runtime set stays numpy, llvmlite, grpcio and protobuf.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PROTO_DIR = Path(__file__).resolve().parent / "rpc_tracker" / "proto"


def compile_protos() -> None:
    import grpc_tools
    from grpc_tools import protoc

    include = str(Path(grpc_tools.__file__).resolve().parent / "_proto")
    root = PROTO_DIR.parent.parent
    for proto in sorted(PROTO_DIR.glob("*.proto")):
        rel = proto.relative_to(root)
        status = protoc.main(["grpc_tools.protoc", f"-I{root}", f"-I{include}",
                              f"--python_out={root}", f"--pyi_out={root}",
                              f"--grpc_python_out={root}", str(rel)])
        if status != 0:
            raise RuntimeError(f"protoc failed on {rel} (exit status {status})")


class BuildPyWithProtos(build_py):
    def run(self):
        compile_protos()
        super().run()


setup(cmdclass={"build_py": BuildPyWithProtos})
