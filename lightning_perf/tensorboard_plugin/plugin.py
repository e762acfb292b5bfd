"""The Perf tab's TensorBoard plugin: the static page and one JSON route a pane.

Registered with the ``tensorboard_plugins`` entry point (pyproject.toml), as torch-tb-profiler registers itself;
TensorBoard loads it with a ``BasicLoader`` and shows the tab while a ``perf_summary.json`` lies under the log
dir. The frontend is an iframe ES module (``frontend_metadata(es_module_path=...)``) that opens ``index.html``:
plain files from ``static/``, every script and style served from here, nothing from the internet.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import msgspec
from tensorboard.plugins import base_plugin
from werkzeug import Request, Response
from werkzeug.exceptions import BadRequestKeyError

from lightning_perf.errors import LightningPerfError
from lightning_perf.tensorboard_plugin import panes, runs
from lightning_perf.traces.exports import trace_to_speedscope

PLUGIN_NAME = "lightning_perf"
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
# The page is ours alone: nothing it loads may come from elsewhere, so a stray URL fails loudly offline too.
_HEADERS = [
    ("X-Content-Type-Options", "nosniff"),
    ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'"),
]


class PerfPlugin(base_plugin.TBPlugin):
    """TensorBoard's "Perf" tab for lightning-perf runs."""

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        super().__init__(context)
        self.logdir = os.path.abspath(os.path.expanduser(context.logdir)) if context.logdir else ""

    def is_active(self) -> bool:
        return runs.has_runs(self.logdir)

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Perf", disable_reload=True)

    def get_plugin_apps(self) -> dict[str, Callable[..., Any]]:
        # Request.application makes a WSGI app of a function of the request (bound here: typed as such)
        static = {f"/{name}": Request.application(self._static) for name in os.listdir(STATIC_DIR)}
        return {
            **static,
            "/runs": self._json(lambda args: {"logdir": self.logdir, "runs": runs.run_list(self.logdir)}),
            "/overview": self._json(lambda args: runs.overview(self.logdir, args["run"])),
            "/trace": self._json(lambda args: panes.trace_pane(self.logdir, args["run"], args["file"])),
            "/trace_ranks": self._json(lambda args: panes.trace_ranks_pane(self.logdir, args["run"])),
            "/compare": self._json(
                lambda args: panes.compare_pane(self.logdir, args.getlist("run"), args["baseline"])
            ),
            "/trials": self._json(lambda args: {"trials": panes.trials_pane(self.logdir)}),
            "/file": Request.application(self._download),
            "/speedscope": Request.application(self._speedscope),
        }

    def _static(self, request: Request) -> Response:
        name = os.path.basename(request.path)
        with open(os.path.join(STATIC_DIR, name), "rb") as fh:
            body = fh.read()
        kind = _TYPES.get(os.path.splitext(name)[1], "application/octet-stream")
        return Response(body, content_type=f"{kind}; charset=utf-8", headers=_HEADERS)

    def _json(self, make: Callable[[Any], Any]) -> Callable[..., Any]:
        """A route answering ``make(query arguments)`` as JSON; a missing argument (400), an unknown run or file
        (404) or an unreadable summary or trace (422) answers the error's message, which the pane shows."""

        @Request.application
        def route(request: Request) -> Response:
            try:
                data, status = make(request.args), 200
            except runs.UnknownRun as err:
                data, status = {"error": str(err)}, 404
            except BadRequestKeyError as err:
                data, status = {"error": f"missing query argument {err.args[0]!r}"}, 400
            except (LightningPerfError, OSError) as err:  # a corrupt summary or trace, a bad comparison
                data, status = {"error": str(err)}, 422
            return Response(
                msgspec.json.encode(data), status=status, content_type="application/json", headers=_HEADERS
            )

        return route

    def _download(self, request: Request) -> Response:
        try:
            path = runs.run_file(self.logdir, request.args["run"], request.args["file"])
        except (runs.UnknownRun, BadRequestKeyError) as err:
            return Response(str(err), status=404, content_type="text/plain", headers=_HEADERS)
        with open(path, "rb") as fh:
            return _attachment(fh.read(), os.path.basename(path))

    def _speedscope(self, request: Request) -> Response:
        """The trace as a Speedscope file (``lightning-perf report``'s export), made on the click."""
        try:
            path = runs.run_file(self.logdir, request.args["run"], request.args["file"])
            with tempfile.TemporaryDirectory(prefix="lightning_perf_tab_") as scratch:
                out = os.path.join(scratch, "trace.speedscope.json")
                trace_to_speedscope(path, out)
                with open(out, "rb") as fh:
                    body = fh.read()
        except (runs.UnknownRun, BadRequestKeyError) as err:
            return Response(str(err), status=404, content_type="text/plain", headers=_HEADERS)
        except (LightningPerfError, OSError) as err:
            return Response(str(err), status=422, content_type="text/plain", headers=_HEADERS)
        name = os.path.basename(path).split(".json")[0] + ".speedscope.json"
        return _attachment(body, name)


def _attachment(body: bytes, name: str) -> Response:
    return Response(
        body,
        content_type="application/octet-stream",
        headers=[*_HEADERS, ("Content-Disposition", f'attachment; filename="{name}"')],
    )
