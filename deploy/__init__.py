"""Deployment configuration: lexgraph on Kubernetes with Dagster's own dagster-k8s (see docs/SCALING.md)."""
