"""tensorplay.distributed: distributed helpers; rpc is the one there is."""
