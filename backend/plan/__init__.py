"""What a run is before anything runs: the RunSpec and its validation, the task's rules, the recipe that turns a spec
into JobSpecs, the engines (what each executor answers before it runs anything), flavors, prices and cost. Pure,
but for the engines' questions to their cluster or the Hub's price list."""
