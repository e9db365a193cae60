"""The operator's tools: the ``lakestream`` command, ``status``, ``verify``."""
