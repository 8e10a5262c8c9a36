"""`make bench`: side-by-side timings against the device-copy roofline and peers (GPU only)."""
