"""Why this token: attributions of a step's choice to the model's parts and to the prompt."""
