"""The v2alpha1 resource models, names and numbers; imports nothing of ours."""
