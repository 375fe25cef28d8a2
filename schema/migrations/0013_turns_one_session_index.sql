-- turns_by_session (session_id, id) duplicated what turns_conversation (session_id, coalesce(parent_id, id),
-- id) serves: every lookup by session, and the conversation order each reader shows. Each session-keyed
-- index costs a group commit one leaf page per session it writes to (a busy writer's largest cost after the
-- turns themselves), so the last few readers that wanted plain id order (`session show`, the MCP
-- session_show tool, retention's chunks) now read in conversation order.
DROP INDEX IF EXISTS turns_by_session;
