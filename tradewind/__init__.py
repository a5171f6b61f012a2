"""Tradewind: language-model training work that AI agents run through MCP.

Layers, lowest first: `core`, `prompts`, `cluster`, `data`, `trainer`, `tools`, `server`.
A lower layer never imports a higher one.
"""

__version__ = "0.1.0"
