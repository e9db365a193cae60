"""The main job: rollout producers and a trainer sharing one local stream (``lakestream demo``)."""
