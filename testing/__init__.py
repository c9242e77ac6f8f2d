"""Test fixtures and offline stand-ins: what the tests and `make cloud-offline` import (moto
gaps, the offline task launcher, the NLB and its DNS, reference servers, the report browser)."""
