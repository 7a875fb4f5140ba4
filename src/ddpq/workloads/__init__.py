"""Built-in training programs. Their contract with ddpq is argv, environment and files only."""
