"""What a run costs: its estimate (`cost`) from AWS's Price List API (`price_list`), EC2's spot price
history and the bundled table (`pcflow.prices`).

A layer of its own below the core stages: the budget (before a run and during it) and the harvest (after
it) price with it, so neither imports the other for prices.
"""
