"""Runnable lightning-perf case studies (synthetic data by default, so they run offline)."""
