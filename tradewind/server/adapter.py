"""Turning a Tradewind tool function into an MCP tool, without writing any schema by hand.

A tool is `tool(ctx, request, [progress]) -> Result`. The MCP SDK builds a tool's input schema from the
function signature, so the adapter gives the MCP-facing function one keyword parameter per field of the
request model (with the field's type, default and description): agents see flat arguments, and the
schema comes from the same pydantic model the Python API uses. The output schema comes from the
result model. Errors Tradewind raises on purpose become MCP error results carrying their message.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any

import anyio.from_thread
import anyio.lowlevel
import pydantic
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from tradewind.core import TradewindError, describe_validation_error
from tradewind.tools import ToolContext


def _signature(request_model: type[pydantic.BaseModel], result_model: type) -> inspect.Signature:
    parameters = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=Annotated[field.annotation, field],  # the FieldInfo carries default and description
        )
        for name, field in request_model.model_fields.items()
    ]
    parameters.append(inspect.Parameter("mcp_context", inspect.Parameter.KEYWORD_ONLY, annotation=Context))
    return inspect.Signature(parameters, return_annotation=result_model)


def _progress_reporter(mcp_context: Context) -> Callable[[float, float | None, str | None], None]:
    """A progress callback that notifies the MCP client, callable from any thread.

    Made in the tool's worker thread, it keeps that request's event-loop token, so that threads the tool
    code starts itself (a Rust tokenizer's, a build's poller) can report progress too.
    """
    loop = anyio.from_thread.run_sync(anyio.lowlevel.current_token)

    def report(done: float, total: float | None = None, message: str | None = None) -> None:
        anyio.from_thread.run(mcp_context.report_progress, done, total, message, token=loop)

    return report


def _sent(mcp_context: Context, arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments the client sent, as the SDK validated them, without the defaults it filled in.

    The request model then knows which fields were given (`model_fields_set`): a run that continues another
    inherits every field the call leaves out, and `init_from` refuses only model fields that were set.
    """
    params = mcp_context.request_context.params or {}
    sent = params.get("arguments") or {}
    return {name: value for name, value in arguments.items() if name in sent}


def as_mcp_tool(tool: Callable[..., Any], ctx: ToolContext) -> Callable[..., Any]:
    """Wrap `tool` so that `MCPServer.add_tool` publishes its request and result models as schemas.

    The wrapper is synchronous: the SDK runs it in a worker thread, so a long tool never blocks the
    server's event loop and other calls are answered meanwhile.
    """
    hints = typing.get_type_hints(tool)
    request_model, result_model = hints["request"], hints["return"]
    reports_progress = "progress" in inspect.signature(tool).parameters

    @functools.wraps(tool)
    def call(mcp_context: Context, **arguments: Any) -> Any:
        try:
            request = request_model.model_validate(_sent(mcp_context, arguments))
            if reports_progress:
                return tool(ctx, request, progress=_progress_reporter(mcp_context))
            return tool(ctx, request)
        except pydantic.ValidationError as error:
            raise ToolError(describe_validation_error(error, f"{tool.__name__} arguments")) from None
        except TradewindError as error:
            raise ToolError(str(error)) from None

    call.__signature__ = _signature(request_model, result_model)  # type: ignore[attr-defined]
    call.__annotations__ = {"mcp_context": Context, "return": result_model}
    del call.__wrapped__  # make inspect use __signature__, not the tool's own parameters
    return call
