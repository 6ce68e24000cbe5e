"""tensorplay: the Python face of tensorplay-rpc (see tensorplay.distributed.rpc)."""
