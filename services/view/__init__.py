"""`trinity view`: a local web page over a run's files and its buffers' experiences.

- run_dir.py: what a run directory holds (stages, configs, buffer files, progress, evals);
- index.py: the viewer's own SQLite index of every experience it has seen, with the columns
  the filters need (the buffer's files are opened read-only and never changed);
- query.py: filters from a query string and the paged, indexed SQL over the index;
- detail.py, tokens.py: one experience decoded for display (tokens, action mask, logprobs, the
  advantage the run's algorithm gives it in its group);
- viewer.py: what the pages read (the run re-read while live, curves, services, progress);
- svg.py, html.py, pages_run.py, pages_rows.py, pages_evals.py: server-rendered HTML, inline SVG;
- app.py: routes and the token check (no sockets); server.py: the stdlib HTTP server around it.
"""
