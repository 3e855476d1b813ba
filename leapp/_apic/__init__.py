"""Warp's API-capture (APIC) records, read without Warp's native library."""
