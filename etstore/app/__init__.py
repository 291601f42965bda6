"""The application layer: what loads, runs and records, between the readers and the store.

A module here reads files (``etstore.ingest``), computes what it must and writes the
result through a store (``etstore.store``), so that ``store/`` only stores and never
imports a reader. ``report/`` and ``cli/`` call it; it calls the floors below it.

* :mod:`~etstore.app.ingest_files` — ingest of files: each input (a trace, an
  nccl-tests log or a tuner trajectory, recognised by its content) stored all or nothing;
* :mod:`~etstore.app.measured` — a parsed nccl-tests / rccl-tests log as a measured run;
* :mod:`~etstore.app.tuner` — a parsed tuner trajectory as a tuner run, its steps linked
  to the stored algorithms they ran.

Nothing is re-exported: import the module that does the work (each loads pyarrow).
"""
