-- What a gateway knows of a person's message, typed, in columns of its own (it was a JSON `meta` that
-- shared the column with the runner's tool-call records): the platform's thread or topic id within the
-- chat's room, the chat's kind (private, group, channel), the id of the message an edit edits, and the
-- platform's timestamp of the message in seconds (0: not given). Other turns keep the defaults.
ALTER TABLE turns ADD COLUMN thread TEXT NOT NULL DEFAULT '';
ALTER TABLE turns ADD COLUMN chat_kind TEXT NOT NULL DEFAULT '';
ALTER TABLE turns ADD COLUMN edit_of TEXT NOT NULL DEFAULT '';
ALTER TABLE turns ADD COLUMN sent_at REAL NOT NULL DEFAULT 0;
