"""Tests of the deployment files: helm-values/, Dockerfile and .dockerignore."""
