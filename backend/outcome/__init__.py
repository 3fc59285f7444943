"""What a run produced: held-out scores per version (`held_out`, `ranking`, `published_best`), which version a pick
means and which one is best (`best_version`), the reward-hacking sign (`hacking_sign`), trying versions on a prompt
(`try_it`), pushing an adapter to a model repo (`publish`)."""
