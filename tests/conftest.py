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


@pytest.fixture(scope="session")
def measured():
    """The measured H100 timings folder; the calibration and notebook 10's tests fail without it."""
    from batchlab import calibrate
    try:
        return calibrate.measured_dir()
    except FileNotFoundError as err:
        pytest.fail(f"the measured H100 timings are needed: {err}", pytrace=False)
