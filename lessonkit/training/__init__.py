"""Training: every trainer in the workbook, each writing a model folder with its manifest and card.

  tiny_models   the shipped tiny targets and drafters (`lessonkit train`)
  distill       teacher passes and distilled drafters
  cut_draft     a drafter cut from its target's layers
  mtp_heads     multi-token-prediction heads (`lessonkit mtp train`)
  judge         the semantic cache's judge (LoRA on tiny-moe), with judge_data its examples and judge_ndjson
                its NDJSON answers counted for the card (through the stack's Judge)
  lora          the LoRA model the judge trains
  model_card    the card written beside each trained model

Imports: the engine, models, workloads, the techniques (a head or drafter it trains) and the stack (the judge's
NDJSON answers). Nothing below imports training: a technique loads what training wrote, never the trainer.
"""
