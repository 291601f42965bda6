"""Build hook for the optional native extensions; all metadata lives in pyproject.toml.

Every extension is ``optional``: without a C compiler the build still succeeds and
etstore falls back to its Python reference: the decoder in ``etstore/ingest/et.py``,
the standard library's expat parser for MSCCL-IR XML, and the event loop ``_run`` in
``etstore/sim/engine.py``.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "etstore.ingest._etcodec",
            sources=["etstore/ingest/_etcodec.c"],
            optional=True,
        ),
        Extension(
            "etstore.ingest._xmlscan",
            sources=["etstore/ingest/_xmlscan.c"],
            optional=True,
        ),
        Extension(
            "etstore.sim._simloop",
            sources=["etstore/sim/_simloop.c"],
            optional=True,
        ),
    ]
)
