"""Running the streamable-HTTP app under uvicorn."""

from __future__ import annotations


def run_http(app, host: str, port: int, log_level: str) -> None:
    """Serve `app` on `host:port` until the process is stopped.

    uvicorn logs its start-up and errors at `log_level`; the access line per request only at DEBUG (it is a
    measurable share of a quick call, see the MCP section of docs/reports/benchmarks.md). The event loop is
    uvloop where it is installed (orbax-checkpoint depends on it), else asyncio's own; the HTTP parser is
    httptools where installed, else h11 (uvicorn's "auto").
    """
    import importlib.util

    import anyio
    import uvicorn

    level = log_level.lower()
    config = uvicorn.Config(app, host=host, port=port, log_level=level, access_log=level == "debug", http="auto")
    backend_options = {"use_uvloop": True} if importlib.util.find_spec("uvloop") else {}
    anyio.run(uvicorn.Server(config).serve, backend_options=backend_options)
