"""Parameter-server training: TensorLayer's cluster specs, DistributedSession and Trainer."""
