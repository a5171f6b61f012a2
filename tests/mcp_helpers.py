"""Helpers the MCP tests share."""


async def call(client, name, arguments=None, **kwargs):
    """Call tool `name` through the MCP client; fail on an error result; return its structured content."""
    result = await client.call_tool(name, arguments or {}, **kwargs)
    assert not result.is_error, result.content
    return result.structured_content
