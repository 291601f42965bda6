"""Tests of etstore.topology: the value type, routes, cuts, the spec grammar, the file readers."""
