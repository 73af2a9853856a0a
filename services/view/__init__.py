"""`trinity view`: a local web page over a run's files and its buffers' experiences.

- run_dir.py: what a run directory holds (stages, configs, buffer files, progress, evals);
- index.py: the viewer's own SQLite index of every experience it has seen, with the columns
  the filters need (the buffer's files are opened read-only and never changed);
- query.py: filters from a query string and the paged, indexed SQL over the index;
- detail.py: one experience decoded for display (tokens, action mask, logprobs, advantage);
- svg.py, html.py, pages.py: server-rendered HTML with inline SVG charts;
- app.py: routes and token check (no sockets); server.py: the stdlib HTTP server around it.
"""
