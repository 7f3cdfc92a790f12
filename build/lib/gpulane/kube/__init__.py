"""The Kubernetes plumbing that gpulane's components share: one client with its errors, one watch."""
