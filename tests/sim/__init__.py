"""Tests of etstore.sim: replay, network models, metrics."""
