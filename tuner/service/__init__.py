"""The tuning service: job specs, the REST API (FastAPI), job workers and the HTTP client.

`tunefarm serve` runs the API (and, by default, one local worker); `tunefarm worker` processes
claim jobs from the records database; `tunefarm submit` / `tunefarm jobs` talk to the API.
The records store is the service's only state.
"""
