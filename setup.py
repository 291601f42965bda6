"""Build hook for the optional native .et codec; all metadata lives in pyproject.toml.

The extension is ``optional``: without a C compiler the build still succeeds and
etstore falls back to the pure-Python decoder in ``etstore/ingest/et.py``.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "etstore.ingest._etcodec",
            sources=["etstore/ingest/_etcodec.c"],
            optional=True,
        )
    ]
)
