"""`astraflow run`: every component of a recipe under one supervisor, with a dashboard and a report."""
