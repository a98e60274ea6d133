"""Click commands of the ``topoopt`` CLI, one module each."""
