"""Commands around training: plan, auto, report, export, k8s, export-verl."""
