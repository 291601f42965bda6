"""Named analyses over stored traces (each a plain function returning Arrow tables)."""

from etstore.query.critical_path import CriticalPath, critical_path

__all__ = ["CriticalPath", "critical_path"]
