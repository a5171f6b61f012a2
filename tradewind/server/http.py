"""Running the streamable-HTTP app under uvicorn."""

from __future__ import annotations


def run_http(app, host: str, port: int, log_level: str) -> None:
    """Serve `app` on `host:port` until the process is stopped."""
    import anyio
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower())
    anyio.run(uvicorn.Server(config).serve)
