"""The plan layer's foundation (pure numpy): input validation, the cost model,
the ``Plan`` (flat arrays), hashing, configuration and state vocabulary."""
