"""``ilab-journal serve``: a live web page of runs over their journals (docs/serve.md).

Needs the ``serve`` extra (starlette, uvicorn, numpy); uPlot ships in ``static/``."""
