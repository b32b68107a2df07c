"""What Slack accepts in a message, a block and a modal, and the stricter caps we keep to.

Every builder of this package keeps within Slack's limits: 50 blocks (100 in a modal), section
text 3000 characters, button text 75 and value 2000, context element text 2000, and a whole
`blocks` payload, measured as slack_sdk sends it (ASCII JSON), well under the ~13k characters at
which Slack answers `msg_blocks_too_long`. The `text` fallback stays within 3000 characters.
"""

from __future__ import annotations

SECTION_MAX = 3000
CONTEXT_TEXT_MAX = 2000
BUTTON_VALUE_MAX = 2000
BUTTON_TEXT_MAX = 75
TEXT_MAX = 3000  # our own cap on the `text` fallback (Slack allows 40000)
BLOCKS_JSON_MAX = 11500  # Slack refuses blocks of ~13k characters; stay clear of 12k
PRIVATE_METADATA_MAX = 3000
MODAL_BLOCKS_MAX = 100
