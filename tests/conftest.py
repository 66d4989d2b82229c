import os
import sys

import pytest
from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile("batchlab", deadline=None, print_blob=True)
settings.load_profile("batchlab")


@pytest.fixture(scope="session")
def h100():
    import batchlab as bl
    return bl.get_hardware("h100-sxm")


@pytest.fixture(scope="session")
def cost8b(h100):
    import batchlab as bl
    return bl.CostModel(h100, bl.get_model("llama-3-8b"))
