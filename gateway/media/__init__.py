"""Attachments: what the platforms send besides text, and what the model gets from them."""
