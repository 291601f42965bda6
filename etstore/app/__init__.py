"""The application layer: what loads, runs and records, between the readers and the store.

A module here reads files (``etstore.formats``) or stored traces, computes what it must
(``etstore.sim``, ``etstore.analysis``) and writes the result through a store
(``etstore.store``), so that ``store/`` only stores and never imports a reader, and the
simulator and the analyses stay functions of their inputs. ``report/`` and ``cli/`` call
it; it calls the floors below it.

* :mod:`~etstore.app.ingest_files` — ingest of files: each input (a trace, an
  nccl-tests log or a tuner trajectory, recognised by its content) stored all or nothing;
* :mod:`~etstore.app.measured` — a parsed nccl-tests / rccl-tests log as a measured run;
* :mod:`~etstore.app.tuner` — a parsed tuner trajectory as a tuner run, its steps linked
  to the stored algorithms they ran;
* :mod:`~etstore.app.runs` — simulation results recorded as runs (one run, jobs sharing a
  fabric, a sensitivity sweep) and bus-bandwidth sweeps;
* :mod:`~etstore.app.fanout` — independent pieces of work run here or as Ray tasks, results
  back in order, a failing piece reported without stopping the rest;
* :mod:`~etstore.app.sweeps` — bus-bandwidth sweeps and what-if grids with their points on
  such an executor (the same rows as the serial sweep);
* :mod:`~etstore.app.compare` — two stored traces simulated and their differences recorded;
* :mod:`~etstore.app.calibrate` — a stored measured run's curve fitted, the fit stored by name;
* :mod:`~etstore.app.opportunities` — a stored trace's opportunities found and recorded;
* :mod:`~etstore.app.rewrite` — a stored trace rewritten (opportunities applied), stored as
  its child with lineage;
* :mod:`~etstore.app.rescale` — a stored trace rescaled, stored as its child;
* :mod:`~etstore.app.critical_path`, :mod:`~etstore.app.breakdown` — a stored trace's critical
  path and measured breakdowns, read a unit of whole ranks at a time (memory bounded by a unit,
  not the trace);
* :mod:`~etstore.app.publish` — an embedded store's traces, runs and metrics published to a
  Neo4j server (``etstore publish``), idempotently.

``sim/`` and ``analysis/`` compute and return tables and objects; what loads their input from
a store and records their output is here.

Nothing is re-exported: import the module that does the work (each loads pyarrow).
"""
