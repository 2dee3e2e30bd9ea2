"""The ways of buying (orders, reservations, spot, resale), paying (payments), and what surrounds them: the
catalog, projects, API keys, the demo's seed. Products don't import each other, except orders, which routes
an order to its mode's module."""
