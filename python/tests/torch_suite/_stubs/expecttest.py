"""Stand-in for PyPI's expecttest (not packaged by Debian), which
torch.testing._internal.common_utils imports at module level. Only
assertExpectedInline would need the real one, and no rpc test calls it."""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, *args, **kwargs):
        raise NotImplementedError("the expecttest stand-in cannot check inline expectations")
