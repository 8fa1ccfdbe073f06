"""Live terminal dashboard, Grafana dashboard and Prometheus scrape config."""
