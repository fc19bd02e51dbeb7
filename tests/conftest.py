from tests.llm_server import llm_server, openai_model, llm_server_session  # noqa
