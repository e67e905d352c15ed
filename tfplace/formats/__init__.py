"""Typed, validated values and their files: errors, strict JSON, cluster, strategy, profile,
train/activate configs and reports. Every loader names the file, the field and the fix."""
