"""The projector: plans each ended run's projections from its journal and delivers them off the critical path."""
