"""What a run produced: held-out scores per version and which one is best (`best_version`), trying versions on a
prompt (`try_it`), pushing an adapter to a model repo (`publish`)."""
