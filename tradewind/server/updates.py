"""Resource updates: a listening client hears when a run's resources change, without polling.

Training runs are other processes writing files under `runs/<run_id>/`, so the server learns of a change by
looking. A client opts in with `subscriptions/listen` (MCP 2026-07-28), naming resource URIs and whether it wants
list changes; while at least one such stream is open, `RunWatcher` looks about once a second at what the open
streams asked for and publishes on the server's subscription bus, which delivers each event to the streams that
asked for it:

    notifications/resources/updated       tradewind://runs/{run_id}/{config,metrics,logs,report,plot,profile}: the
                                          file the resource serves changed (size or modification time), or came
    notifications/resources/updated       tradewind://runs: a run came or went, or its record (status) or summary
                                          changed
    notifications/resources/list_changed  a run folder came or went

A look stats files and lists the runs folder, nothing more: it never reads a file's content or writes anything
(a read-only server stays read-only), and its cost is bounded by what the streams asked for and the number of
runs. It runs in the listen requests' own tasks, off the event loop in a worker thread; the streams open at once
share one look a tick, and with the last stream closed (or the server stopped) nothing looks at all.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Hashable, Iterable
from typing import Any

import anyio
import anyio.to_thread
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.subscriptions import ResourcesListChanged, ResourceUpdated, ServerEvent, SubscriptionBus
from mcp.types import SubscriptionsListenRequestParams
from pydantic import ValidationError

from tradewind.core import TradewindError, Workspace, check_id
from tradewind.core.files import file_state
from tradewind.runs import RunLayout
from tradewind.server.completion import id_entries
from tradewind.server.resources import RUN_LIST_URI, RUN_PARTS, run_part_path

LOOK_EVERY_S = 1.0
RUN_LIST_UPDATED = ResourceUpdated(RUN_LIST_URI)
_RUN_PART_URI = re.compile(rf"tradewind://runs/(?P<run_id>[^/]+)/(?P<part>{'|'.join(RUN_PARTS)})")


def run_part_of(uri: str) -> tuple[str, str] | None:
    """The run id and part (`RUN_PARTS`) a run resource's URI names; None for any other URI or a bad id."""
    match = _RUN_PART_URI.fullmatch(uri)
    if match is None:
        return None
    try:
        return check_id(match["run_id"], "run_id"), match["part"]
    except TradewindError:
        return None


class RunWatcher:
    """Server middleware that follows the runs the open `subscriptions/listen` streams asked about and publishes
    their changes on `bus`, the subscription bus those streams read.

    Each watched thing is keyed by the event its change publishes: `ResourceUpdated(uri)` for a run resource or the
    run list, `ResourcesListChanged()` for the set of runs.

    Args:
        workspace: whose `runs/` folder to watch (only stated and listed, never written).
        bus: the bus the server was built with (`MCPServer(subscriptions=bus)`).
        every_s: how often the open streams look, together.
    """

    def __init__(self, workspace: Workspace, bus: SubscriptionBus, every_s: float = LOOK_EVERY_S):
        self._workspace = workspace
        self._bus = bus
        self._every_s = every_s
        self._streams: Counter[ServerEvent] = Counter()  # each watched event: how many open streams want it
        self._seen: dict[ServerEvent, Hashable] = {}  # each watched event's subject, as the last look saw it
        self._lock = anyio.Lock()  # one look at a time, and none while a new stream's first look is taken
        self._last_tick = -1

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "subscriptions/listen":
            return await call_next(ctx)
        wanted = self._wanted(ctx.params)
        # The stream's first look is taken before the listen handler acknowledges: whatever the client does once it
        # holds the acknowledgement is a change the next look sees.
        await self._join(wanted)
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._look_every_tick)
                result = await call_next(ctx)  # returns when the stream ends
                tasks.cancel_scope.cancel()
            return result
        finally:
            self._leave(wanted)

    @staticmethod
    def _wanted(params: Any) -> list[ServerEvent]:
        """The events a listen request's `params` ask for that this watcher publishes (others never fire)."""
        try:
            asked = SubscriptionsListenRequestParams.model_validate(params or {}).notifications
        except ValidationError:
            return []  # the listen handler refuses the request and says why
        uris = asked.resource_subscriptions or ()
        wanted: list[ServerEvent] = [
            ResourceUpdated(uri) for uri in uris if uri == RUN_LIST_URI or run_part_of(uri) is not None
        ]
        if asked.resources_list_changed:
            wanted.append(ResourcesListChanged())
        return wanted

    async def _join(self, wanted: list[ServerEvent]) -> None:
        async with self._lock:
            new = [event for event in set(wanted) if event not in self._streams]
            self._streams.update(wanted)
            self._seen.update(await anyio.to_thread.run_sync(self._look, new))

    def _leave(self, wanted: list[ServerEvent]) -> None:
        self._streams.subtract(wanted)
        for event in set(wanted):
            if self._streams[event] <= 0:
                del self._streams[event]
                self._seen.pop(event, None)

    async def _look_every_tick(self) -> None:
        """Look once a tick for as long as this stream is open; the streams open at once share each tick's look."""
        while True:
            await anyio.sleep(self._every_s - time.monotonic() % self._every_s)
            tick = round(time.monotonic() / self._every_s)  # round: a wake a hair early still names its tick
            if tick > self._last_tick:
                self._last_tick = tick
                await self._publish_changes()

    async def _publish_changes(self) -> None:
        async with self._lock:
            now = await anyio.to_thread.run_sync(self._look, list(self._seen))
            # A stream that closed during the look took its events out of `_seen`: they are not published.
            changed = [event for event, state in now.items() if event in self._seen and self._seen[event] != state]
            self._seen.update((event, now[event]) for event in changed)
        for event in changed:
            await self._bus.publish(event)

    def _look(self, events: Iterable[ServerEvent]) -> dict[ServerEvent, Hashable]:
        """How the subject of each of `events` stands now: a run file's state, or the runs and their records."""
        events = list(events)
        runs: list[str] = []
        if RUN_LIST_UPDATED in events or ResourcesListChanged() in events:
            runs = sorted(entry.name for entry in id_entries(self._workspace.runs_dir))
        states: dict[ServerEvent, Hashable] = {}
        for event in events:
            if isinstance(event, ResourcesListChanged):
                states[event] = tuple(runs)
            elif event == RUN_LIST_UPDATED:
                layouts = [RunLayout(self._workspace.runs_dir / name) for name in runs]
                states[event] = tuple(
                    (layout.root.name, file_state(layout.record), file_state(layout.summary)) for layout in layouts
                )
            else:
                run_id, part = run_part_of(event.uri)
                states[event] = file_state(run_part_path(self._workspace, run_id, part))
        return states
