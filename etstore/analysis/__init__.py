"""Named analyses over stored traces (each a plain function returning Arrow tables)."""

from etstore.analysis.critical_path import PATH_COLUMNS, PATH_VIA, CriticalPath, critical_path, path_table

__all__ = ["PATH_COLUMNS", "PATH_VIA", "CriticalPath", "critical_path", "path_table"]
