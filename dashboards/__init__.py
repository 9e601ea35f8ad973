"""llmsre's Grafana dashboards: the panel lists (boards.py), their JSON rendering (grafana.py), the generated *.json."""
