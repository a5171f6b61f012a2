"""Helpers the MCP tests share."""

import base64
import json


async def call(client, name, arguments=None, **kwargs):
    """Call tool `name` through the MCP client; fail on an error result; return its structured content."""
    result = await client.call_tool(name, arguments or {}, **kwargs)
    assert not result.is_error, result.content
    return result.structured_content


def answer_chars(result) -> int:
    """What a tool call's answer costs an agent's context, in characters: every text block's text, every other
    block but images as the JSON it is sent as (resource links), and the structured content as sent (compact JSON,
    non-ASCII kept). Images are counted apart (`images_of`)."""
    blocks = 0
    for block in result.content:
        if block.type == "text":
            blocks += len(block.text)
        elif block.type != "image":
            blocks += len(block.model_dump_json(by_alias=True, exclude_none=True))
    if result.structured_content is None:
        return blocks
    return blocks + len(json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False))


def images_of(result) -> list[bytes]:
    """The images a tool call's answer carries, decoded."""
    return [base64.b64decode(block.data) for block in result.content if block.type == "image"]
