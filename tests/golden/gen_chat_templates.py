#!/usr/bin/env python3
"""Chat-template goldens.

Writes tests/golden/data/chat_templates/golden.json: a list of cases, each a
Jinja chat template, the keyword arguments it is rendered with ("context") and
either the rendered string ("expected") or the kind of error it raises
("error": "syntax", "raised: <message>", "undefined" or "type").

Oracle: transformers' own chat-template environment,
`transformers.utils.chat_template_utils._compile_jinja_template(template)`
followed by `.render(**context)` -- an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loopcontrols, the `generation` tag, a json.dumps
based `tojson` filter and the globals raise_exception, strftime_now, dict and
namespace.

Every template here was written for this file, in the style of the chat
templates of the Qwen2/SmolLM2 (ChatML), Llama 3, Mistral, Qwen3, DeepSeek, GLM-4.5 and
Gemma families, except the real SmolLM2 template, which is read from
models/SmolLM2-135M-Instruct.Q4_1.gguf (those cases are skipped without it).

Each context goes through a JSON round trip before rendering, so what the
oracle saw is exactly what the C++ test reads back. Error kinds:
  syntax      jinja2.TemplateSyntaxError when compiling (unknown tags, filters
              and tests are compile-time errors)
  raised: M   raise_exception(M) was called
  undefined   jinja2.UndefinedError (attribute of / call on an undefined value)
  type        any other runtime error: TypeError, the sandbox's
              SecurityError for mutating a list (list.append), or an unknown
              filter reached in an if branch (TemplateRuntimeError)
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
from transformers.utils.chat_template_utils import _compile_jinja_template

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_DIR, SMOLLM2_GGUF, pkg_version, rel, write_json  # noqa: E402

OUT = DATA_DIR / "chat_templates" / "golden.json"
GENERATOR = "tests/golden/gen_chat_templates.py"

CASES: list[dict[str, Any]] = []


def T(src: str) -> str:
    """Template text from a triple-quoted literal: drops the first newline."""
    return src[1:] if src.startswith("\n") else src


def case(name: str, template: str, *, messages: list | None = None, tools: Any = None,
         add_generation_prompt: bool = False, bos_token: str = "<s>",
         eos_token: str = "</s>", error: str | None = None, **extra: Any) -> None:
    context = {
        "messages": messages if messages is not None else [],
        "tools": tools,
        "documents": None,
        "add_generation_prompt": add_generation_prompt,
        "bos_token": bos_token,
        "eos_token": eos_token,
    }
    for k, v in extra.items():
        assert k not in context, k
        context[k] = v
    c: dict[str, Any] = {"name": name, "template": template, "context": context}
    if error is not None:
        c["error"] = error
    CASES.append(c)


# ---------------------------------------------------------------- conversations
CHAT_BASIC = [
    {"role": "user", "content": "Hello! Can you help me plan a trip?"},
    {"role": "assistant", "content": "Of course. Where would you like to go?"},
    {"role": "user", "content": "Somewhere warm in March."},
]

CHAT_SYSTEM = [
    {"role": "system", "content": "You are a concise travel assistant. Answer in two sentences."},
    *CHAT_BASIC,
]

CHAT_MULTILINGUAL = [
    {"role": "system", "content": "  Réponds en français, s'il te plaît.  \n"},
    {"role": "user", "content": "  Qu'est-ce que « déjà vu » veut dire ?\n"},
    {"role": "assistant", "content": "C'est l'impression d'avoir déjà vécu un moment. 😊\n"},
    {"role": "user", "content": "用中文再解释一遍。\n请分两行回答。"},
    {"role": "assistant", "content": ""},
    {"role": "user", "content": "\t¿Y en español? Ñandú, pingüino — ✓ \n\n"},
]

CHAT_MULTILINE = [
    {"role": "user", "content": "Write a haiku about the sea.\nKeep it short."},
    {"role": "assistant", "content": "Grey waves fold and break\n"
                                     "salt wind carries gull voices\n"
                                     "the tide keeps its time"},
]

WEATHER_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    }},
    {"type": "function", "function": {
        "name": "get_time",
        "description": "Local time in an IANA time zone.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                       "required": ["tz"]},
    }},
]

CHAT_TOOLS = [
    {"role": "system", "content": "You can look things up with tools."},
    {"role": "user", "content": "What's the weather in Zürich and the time in Tokyo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}},
        {"id": "call_2", "type": "function",
         "function": {"name": "get_time", "arguments": {"tz": "Asia/Tokyo"}}},
    ]},
    {"role": "tool", "tool_call_id": "call_1",
     "content": "{\"temperature\": 7.5, \"condition\": \"light rain\"}"},
    {"role": "tool", "tool_call_id": "call_2", "content": "21:04"},
    {"role": "assistant", "content": "Zürich: 7.5 °C and light rain. Tokyo: 21:04."},
    {"role": "user", "content": "Thanks! 🙏"},
]

# Without a system message; the assistant says something before its call and
# the tool answers with an object (Llama-style templates print it with tojson).
CHAT_TOOLS_NOSYS = [
    {"role": "user", "content": "Is it raining in Lisbon?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Lisbon"}}},
    ]},
    {"role": "tool", "content": {"temperature": 18, "condition": "sunny", "rain": False}},
    {"role": "assistant", "content": "No, it is sunny and 18 °C in Lisbon."},
]

CHAT_REASONING = [
    {"role": "system", "content": "You are a careful math tutor."},
    {"role": "user", "content": "What is 17 * 3?"},
    {"role": "assistant",
     "content": "<think>\n17 * 3 = 51.\n</think>\n\n17 × 3 = 51."},
    {"role": "user", "content": "And 51 / 3?"},
    {"role": "assistant", "reasoning_content": "\nDividing back gives 17.\n",
     "content": "\n51 / 3 = 17."},
]

CHAT_REASONING_TOOLS = [
    {"role": "user", "content": "How warm is it in Oslo right now?"},
    {"role": "assistant", "reasoning_content": "I need the weather tool.",
     "content": "", "tool_calls": [
         {"type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
     ]},
    {"role": "tool", "content": "{\"temperature\": -3, \"condition\": \"snow\"}"},
    {"role": "assistant",
     "content": "<think>\nThe tool said -3.\n</think>\nIt is -3 °C and snowing."},
]

CHAT_MULTIMODAL = [
    {"role": "system", "content": [{"type": "text", "text": "Describe images briefly."}]},
    {"role": "user", "content": [
        {"type": "image"},
        {"type": "text", "text": "  What is in this picture?  "},
    ]},
    {"role": "assistant",
     "content": [{"type": "text", "text": "A cat asleep on a red sofa. 🐈"}]},
    {"role": "user", "content": [
        {"type": "text", "text": "Compare it with these two:"},
        {"type": "image"},
        {"type": "image"},
    ]},
]

CHAT_BAD_ALTERNATION = [
    {"role": "user", "content": "First question."},
    {"role": "user", "content": "Second question, before any answer."},
]

ALTERNATION_MSG = "Conversation roles must alternate user/assistant/user/assistant/..."

# ---------------------------------------------------------------- realistic templates
CHATML_TOOLS = T(r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Cleave, a friendly assistant.' }}
    {%- endif %}
    {{- '\n\n# Tools\n\nYou may call the functions whose signatures are listed in ' }}
    {{- '<tools></tools>:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each call, answer with a JSON object in <tool_call></tool_call>:' }}
    {{- '\n<tool_call>\n{"name": <name>, "arguments": <object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\nYou are Cleave, a friendly assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first)
          or (message.role == 'assistant' and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
""")

LLAMA3 = T(r"""
{{- bos_token }}
{%- set today = date_string | default('15 Mar 2025') %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = '' %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}
{%- if tools is not none %}
    {{- 'Environment: ipython\n' }}
{%- endif %}
{{- 'Cutting Knowledge Date: December 2024\n' }}
{{- 'Today Date: ' + today + '\n\n' }}
{%- if tools is not none %}
    {{- 'You can call the functions below. To call one, reply only with a JSON object ' }}
    {{- '{"name": function name, "parameters": object of argument names and values}.\n\n' }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- '\n\n' }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- '<|eot_id|>' }}
{%- for message in messages %}
    {%- if message.role in ['user', 'system', 'assistant'] and message.tool_calls is not defined %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}
        {{- message['content'] | trim + '<|eot_id|>' }}
    {%- elif message.tool_calls is defined %}
        {%- if message.content %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
            {{- message.content | trim + '<|eot_id|>' }}
        {%- endif %}
        {%- for call in message.tool_calls %}
            {%- set fn = call.function %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
            {{- '{"name": "' + fn.name + '", "parameters": ' }}
            {{- fn.arguments | tojson }}
            {{- '}<|eot_id|>' }}
        {%- endfor %}
    {%- elif message.role == 'tool' or message.role == 'ipython' %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' }}
        {%- if message.content is mapping
              or (message.content is iterable and message.content is not string) %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
""")

MISTRAL = T(r"""
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate '
                            + 'user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- '[INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] | trim + eos_token }}
    {%- else %}
        {{- raise_exception('Unsupported role: ' + message['role']) }}
    {%- endif %}
{%- endfor %}
""")

QWEN3 = T(r"""
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == 'user' and message.content is string
          and not (message.content.startswith('<tool_response>')
                   and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nFunction signatures, one per line, inside <tools></tools>:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n') %}
            {%- set reasoning = reasoning.split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') }}
            {{- '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or not loop.first %}
                    {{- '\n' }}
                {%- endif %}
                {%- set call = tool_call.function if tool_call.function else tool_call %}
                {{- '<tool_call>\n{"name": "' }}
                {{- call.name }}
                {{- '", "arguments": ' }}
                {%- if call.arguments is string %}
                    {{- call.arguments }}
                {%- else %}
                    {{- call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
""")

# GLM-4.5's style: a tools block listing each tool as JSON, every assistant turn opening a
# <think> block (empty when it has no reasoning), calls as <tool_call>NAME then
# <arg_key>/<arg_value> pairs (strings bare, other values as JSON), tool results as
# <|observation|>, and an empty <think></think> after the generation prompt with thinking off.
GLM45 = T(r"""
[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions. Their signatures:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

Write each call as:
<tool_call>{function-name}
<arg_key>{arg-key-1}</arg_key>
<arg_value>{arg-value-1}</arg_value>
...
</tool_call>
{%- endif -%}
{%- for m in messages %}
    {%- if m.role == 'system' -%}
<|system|>
{{ m.content }}
    {%- elif m.role == 'user' -%}
<|user|>
{{ m.content }}
    {%- elif m.role == 'assistant' -%}
<|assistant|>
{{- '\n<think>' + (m.reasoning_content.strip() if m.reasoning_content else '') + '</think>' }}
        {%- if m.content %}
{{ m.content.strip() }}
        {%- endif %}
        {%- for tc in m.tool_calls or [] %}
            {%- set f = tc.function if tc.function else tc %}
            {{- '\n<tool_call>' + f.name }}
            {%- if f.arguments is mapping %}
                {%- for k, v in f.arguments.items() %}
                    {{- '\n<arg_key>' + k + '</arg_key>\n<arg_value>' }}
                    {{- v if v is string else v | tojson(ensure_ascii=False) }}
                    {{- '</arg_value>' }}
                {%- endfor %}
            {%- endif %}
            {{- '\n</tool_call>' }}
        {%- endfor %}
    {%- elif m.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
<|observation|>
        {%- endif %}
<tool_response>
{{ m.content }}
</tool_response>
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt -%}
<|assistant|>
    {%- if enable_thinking is defined and not enable_thinking %}
<think></think>
    {%- endif %}
{%- endif %}
""")

DEEPSEEK = T(r"""
{%- set ns = namespace(system_prompt='', is_first=false, is_tool=false) %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {%- if ns.system_prompt %}
            {%- set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}
        {%- else %}
            {%- set ns.system_prompt = message['content'] %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}{{- ns.system_prompt }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}
        {%- if ns.is_tool %}
            {{- '<｜tool▁outputs▁end｜>' }}
        {%- endif %}
        {%- set ns.is_tool = false %}
        {{- '<｜User｜>' + message['content'] }}
    {%- elif message['role'] == 'assistant' %}
        {%- if ns.is_tool %}
            {{- '<｜tool▁outputs▁end｜>' }}
        {%- endif %}
        {%- set ns.is_tool = false %}
        {%- set ns.is_first = true %}
        {%- set content = message['content'] %}
        {%- if content is not none and '</think>' in content %}
            {%- set content = content.split('</think>')[-1] %}
        {%- endif %}
        {%- if message['tool_calls'] is defined and message['tool_calls'] is not none %}
            {{- '<｜Assistant｜>' }}
            {%- if content is not none %}
                {{- content }}
            {%- endif %}
            {{- '<｜tool▁calls▁begin｜>' }}
            {%- for tool in message['tool_calls'] %}
                {%- if not ns.is_first %}
                    {{- '\n' }}
                {%- endif %}
                {%- set ns.is_first = false %}
                {{- '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' }}
                {{- tool['function']['name'] + '\n```json\n' }}
                {{- tool['function']['arguments'] | tojson + '\n```<｜tool▁call▁end｜>' }}
            {%- endfor %}
            {{- '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' }}
        {%- else %}
            {{- '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}
        {%- endif %}
    {%- elif message['role'] == 'tool' %}
        {%- if not ns.is_tool %}
            {{- '<｜tool▁outputs▁begin｜>' }}
        {%- else %}
            {{- '\n' }}
        {%- endif %}
        {%- set ns.is_tool = true %}
        {{- '<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
    {%- endif %}
{%- endfor %}
{%- if ns.is_tool %}
    {{- '<｜tool▁outputs▁end｜>' }}
{%- endif %}
{%- if add_generation_prompt %}
    {{- '<｜Assistant｜><think>\n' }}
{%- endif %}
""")

GEMMA = T(r"""
{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- if messages[0]['content'] is string %}
        {%- set first_user_prefix = messages[0]['content'] | trim + '\n\n' %}
    {%- else %}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] | trim + '\n\n' %}
    {%- endif %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set first_user_prefix = '' %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception("Conversation roles must alternate " ~
                            "user/assistant/user/assistant/...") }}
    {%- endif %}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}
    {{- '<start_of_turn>' ~ role ~ '\n' ~ (first_user_prefix if loop.first else '') }}
    {%- if message['content'] is string %}
        {{- message['content'] | trim }}
    {%- elif message['content'] is iterable %}
        {%- for item in message['content'] %}
            {%- if item['type'] == 'image' %}
                {{- '<start_of_image>' }}
            {%- elif item['type'] == 'text' %}
                {{- item['text'] | trim }}
            {%- endif %}
        {%- endfor %}
    {%- else %}
        {{- raise_exception('Message content must be a string or a list') }}
    {%- endif %}
    {{- '<end_of_turn>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<start_of_turn>model\n' }}
{%- endif %}
""")

IM = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
LLAMA_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
DS_TOKENS = {"bos_token": "<｜begin▁of▁sentence｜>",
             "eos_token": "<｜end▁of▁sentence｜>"}
GEMMA_TOKENS = {"bos_token": "<bos>", "eos_token": "<eos>"}


def add_realistic_cases() -> None:
    case("chatml_default_system", CHATML_TOOLS, messages=CHAT_BASIC,
         add_generation_prompt=True, **IM)
    case("chatml_own_system_no_gen", CHATML_TOOLS, messages=CHAT_SYSTEM, **IM)
    case("chatml_multilingual", CHATML_TOOLS, messages=CHAT_MULTILINGUAL,
         add_generation_prompt=True, **IM)
    case("chatml_tools", CHATML_TOOLS, messages=CHAT_TOOLS, tools=WEATHER_TOOLS,
         add_generation_prompt=True, **IM)
    case("chatml_tools_no_system", CHATML_TOOLS, messages=CHAT_TOOLS_NOSYS[:2],
         tools=WEATHER_TOOLS[:1], **IM)

    case("llama3_basic", LLAMA3, messages=CHAT_BASIC, add_generation_prompt=True,
         **LLAMA_TOKENS)
    case("llama3_system_date", LLAMA3, messages=CHAT_MULTILINGUAL,
         date_string="02 Feb 2026", **LLAMA_TOKENS)
    case("llama3_tools", LLAMA3, messages=CHAT_TOOLS, tools=WEATHER_TOOLS,
         add_generation_prompt=True, **LLAMA_TOKENS)
    case("llama3_tool_object_result", LLAMA3, messages=CHAT_TOOLS_NOSYS,
         tools=WEATHER_TOOLS[:1], date_string="29 Feb 2024", **LLAMA_TOKENS)

    case("mistral_basic", MISTRAL, messages=CHAT_BASIC)
    case("mistral_system", MISTRAL, messages=CHAT_SYSTEM, add_generation_prompt=True)
    case("mistral_multiline", MISTRAL, messages=CHAT_MULTILINE, eos_token="<|eos|>")
    case("mistral_bad_alternation", MISTRAL, messages=CHAT_BAD_ALTERNATION,
         error=f"raised: {ALTERNATION_MSG}")
    case("mistral_bad_role", MISTRAL, messages=[CHAT_TOOLS_NOSYS[0], CHAT_TOOLS_NOSYS[2]],
         error="raised: Unsupported role: tool")

    case("qwen3_basic_thinking_default", QWEN3, messages=CHAT_BASIC,
         add_generation_prompt=True, **IM)
    case("qwen3_thinking_disabled", QWEN3, messages=CHAT_SYSTEM,
         add_generation_prompt=True, enable_thinking=False, **IM)
    case("qwen3_thinking_enabled", QWEN3, messages=CHAT_SYSTEM,
         add_generation_prompt=True, enable_thinking=True, **IM)
    case("qwen3_reasoning_history", QWEN3, messages=CHAT_REASONING, **IM)
    case("qwen3_reasoning_earlier_turn", QWEN3, messages=CHAT_REASONING[:4],
         add_generation_prompt=True, **IM)
    case("qwen3_multi_step_tools", QWEN3, messages=CHAT_REASONING_TOOLS,
         tools=WEATHER_TOOLS, **IM)
    case("qwen3_grouped_tools", QWEN3, messages=CHAT_TOOLS, tools=WEATHER_TOOLS,
         add_generation_prompt=True, enable_thinking=False, **IM)

    case("deepseek_basic", DEEPSEEK, messages=CHAT_BASIC, add_generation_prompt=True,
         **DS_TOKENS)
    two_systems = [CHAT_SYSTEM[0], CHAT_SYSTEM[1],
                   {"role": "system", "content": "Prefer trains to planes."}, *CHAT_SYSTEM[2:]]
    case("deepseek_two_systems", DEEPSEEK, messages=two_systems, **DS_TOKENS)
    case("deepseek_tools", DEEPSEEK, messages=CHAT_TOOLS, tools=WEATHER_TOOLS,
         add_generation_prompt=True, **DS_TOKENS)
    case("deepseek_tool_last", DEEPSEEK, messages=CHAT_TOOLS[:5],
         add_generation_prompt=True, **DS_TOKENS)
    case("deepseek_think_stripped", DEEPSEEK, messages=CHAT_REASONING[:3], **DS_TOKENS)

    # GLM-4.5 style: the tools block, two calls with mapping arguments (a number among them),
    # tool results under one observation; thinking off after the generation prompt.
    glm_tools = [dict(m) for m in CHAT_TOOLS]
    glm_tools[2] = {**CHAT_TOOLS[2], "tool_calls": [
        CHAT_TOOLS[2]["tool_calls"][0],
        {"type": "function", "function": {"name": "get_time",
                                           "arguments": {"tz": "Asia/Tokyo", "offset": 9}}}]}
    case("glm45_tools", GLM45, messages=glm_tools, tools=WEATHER_TOOLS, add_generation_prompt=True)
    case("glm45_thinking_off", GLM45, messages=CHAT_REASONING[:4], add_generation_prompt=True,
         enable_thinking=False)

    case("gemma_system_folded", GEMMA, messages=CHAT_SYSTEM, add_generation_prompt=True,
         **GEMMA_TOKENS)
    case("gemma_multilingual_trim", GEMMA, messages=CHAT_MULTILINGUAL, **GEMMA_TOKENS)
    case("gemma_multimodal", GEMMA, messages=CHAT_MULTIMODAL, add_generation_prompt=True,
         **GEMMA_TOKENS)
    case("gemma_no_system", GEMMA, messages=CHAT_MULTILINE, **GEMMA_TOKENS)
    case("gemma_bad_alternation", GEMMA, messages=[CHAT_SYSTEM[0], *CHAT_BAD_ALTERNATION],
         error=f"raised: {ALTERNATION_MSG}", **GEMMA_TOKENS)


def add_smollm2_cases() -> None:
    if not SMOLLM2_GGUF.exists():
        print(f"skipping SmolLM2 cases: {rel(SMOLLM2_GGUF)} not found", file=sys.stderr)
        return
    from gguf import GGUFReader
    field = GGUFReader(SMOLLM2_GGUF).fields["tokenizer.chat_template"]
    template = bytes(field.parts[field.data[0]]).decode("utf-8")
    case("smollm2_no_system_gen", template, messages=CHAT_BASIC, add_generation_prompt=True,
         **IM)
    case("smollm2_system_no_gen", template, messages=CHAT_SYSTEM, **IM)
    case("smollm2_system_gen", template, messages=CHAT_SYSTEM[:2], add_generation_prompt=True,
         **IM)
    case("smollm2_multilingual", template, messages=CHAT_MULTILINGUAL, **IM)
    case("smollm2_empty_conversation_gen", template, messages=[], add_generation_prompt=True,
         **IM)


# ---------------------------------------------------------------- focused cases
LOOP_VARS = T("""
{% for x in items %}
{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}\
/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}: {{ x }}
{% endfor %}
""")

NESTED_LOOPS = T("""
{% for row in grid %}
{% set outer = loop %}
{% for cell in row %}
({{ outer.index }},{{ loop.index }}{{ ',last' if loop.last }}) {{ cell }}
{% endfor %}
{% endfor %}
""")

MACRO_TREE = T("""
{% macro show(node, pad='', bullet='-') %}
{% if node is mapping %}
{% for key, value in node.items() %}
{{ pad }}{{ bullet }} {{ key }}
{{ show(value, pad ~ '  ', '*') }}
{%- endfor %}
{% elif node is string %}
{{ pad }}= {{ node }}
{% else %}
{% for item in node %}{{ show(item, pad, bullet) }}{% endfor %}
{% endif %}
{% endmacro %}
{{ show(tree) -}}
""")


def add_focused_cases() -> None:
    msgs = CHAT_SYSTEM

    # -- delimiters and whitespace control
    case("ws_delimiters_and_comments",
         "a{# a comment {{ not printed }} #}b {{ 'c' }} {% if true %}d{% endif %}\n{#x#}e\n",
         messages=msgs)
    case("ws_dash_on_expressions", "a  \n  {{- 'b' -}}  \n  c {{ 'd' -}}\n e {{- 'f' }}  g",
         messages=msgs)
    case("ws_dash_on_statements",
         "<\n  {%- if true -%}\n    x\n  {%- endif -%}\n>\n{%- for i in [1, 2] %}\n"
         "  [{{ i }}]\n{%- endfor %}\nend",
         messages=msgs)
    case("ws_trim_blocks", "{% if true %}\nline one\n{% endif %}\nline two\n"
         "{% for i in [1, 2] %}\n{{ i }}\n{% endfor %}\ndone\n", messages=msgs)
    case("ws_lstrip_blocks", T("""
    {% if true %}
    indented text keeps its spaces
        {% for i in [1, 2] %}
  item {{ i }}
        {% endfor %}
    {# indented comment #}
    {{ 'expressions are not lstripped' }}
text {% if true %}tag after text keeps the space{% endif %}
    {% endif %}
tail
"""), messages=msgs)
    case("ws_blocks_mixed_with_dash", T("""
<start>
    {%- if true %}
    A
    {%- endif %}

    {% if true -%}
    B
    {% endif -%}
    C
{{ 'D' }}   {%- if false %}x{% endif %}   E
"""), messages=msgs)
    case("ws_text_newlines_around_tags",
         "line1\n\n{{ 'x' }}\n\n{% set y = 1 %}\n\n{{ y }}\n\n{% if y %}yes{% endif %}\n\n",
         messages=msgs)
    case("raw_block", "{% raw %}{{ not rendered }} {% if %}{% endraw %}|"
         "{%- raw -%}  {# kept #}  {%- endraw -%}|", messages=msgs)

    # -- statements
    case("if_elif_else",
         "{% for n in ns %}{% if n > 10 %}big{% elif n > 5 %}medium{% elif n == 0 %}zero"
         "{% else %}small{% endif %} {% endfor %}|{% if flag %}flag{% endif %}"
         "|{% if not flag %}no{% else %}else{% endif %}", messages=msgs, ns=[0, 3, 7, 42],
         flag=True)
    case("for_tuple_unpacking",
         "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}"
         "|{% for a, b in pairs %}{{ a }}{{ b }} {% endfor %}",
         messages=msgs, d={"zeta": 1, "alpha": "two", "mid": None}, pairs=[[1, "x"], [2, "y"]])
    case("for_if_filter",
         "{% for m in messages if m.role != 'system' %}"
         "{{ loop.index }}/{{ loop.length }} {{ m.role }}{{ ',' if not loop.last }}\n{% endfor %}",
         messages=msgs)
    case("for_else",
         "{% for x in empty %}{{ x }}{% else %}nothing here{% endfor %}|"
         "{% for x in [1] %}{{ x }}{% else %}unused{% endfor %}|"
         "{% for m in messages if m.role == 'tool' %}{{ m }}{% else %}no tools{% endfor %}",
         messages=msgs, empty=[])
    case("for_break_continue",
         "{% for i in range(10) %}{% if i is odd %}{% continue %}{% endif %}"
         "{% if i > 6 %}{% break %}{% endif %}{{ i }} {% endfor %}", messages=msgs)
    case("loop_variables", LOOP_VARS, messages=msgs, items=["a", "b", "c"])
    case("loop_nested_outer_ref", NESTED_LOOPS, messages=msgs,
         grid=[["x", "y"], ["z"], []])
    case("set_scoping_in_loop",
         "{% set total = 0 %}{% set ns = namespace(total=0) %}"
         "{% for i in [1, 2, 3] %}{% set total = total + i %}{% set ns.total = ns.total + i %}"
         "[{{ total }},{{ ns.total }}]{% endfor %} after: total={{ total }} ns={{ ns.total }}"
         "{% if true %}{% set in_if = 'if does not scope' %}{% endif %} {{ in_if }}"
         "{% for i in [1] %}{% set in_for = 'x' %}{% endfor %} {{ in_for is defined }}",
         messages=msgs)
    case("set_block",
         "{% set header %}\n  Role list:\n{% for m in messages %}- {{ m.role }}\n{% endfor %}"
         "{% endset %}[{{ header }}]{{ header | trim | length }}", messages=msgs)
    case("set_reassign",
         "{% set a = 1 %}{% set b = 'two' %}{{ a }} {{ b }}{% set a = a + 1 %} {{ a }}"
         "{% set b = b ~ a %} {{ b }}", messages=msgs)
    case("macro_defaults",
         "{% macro turn(role, text='', end='<|end|>') %}<|{{ role }}|>{{ text }}{{ end }}"
         "{% endmacro %}{{ turn('user', 'hi') }}|{{ turn('assistant') }}|"
         "{{ turn('system', end='\\n', text='be nice') }}|{{ turn(role='tool', text=7) }}",
         messages=msgs)
    case("macro_recursion", MACRO_TREE, messages=msgs,
         tree={"root": {"left": ["leaf A", "leaf B"], "right": {"deep": "leaf C"}},
               "solo": "leaf D"})
    case("macro_recursive_countdown",
         "{% macro down(n) %}{{ n }}{% if n > 0 %},{{ down(n - 1) }}{% endif %}{% endmacro %}"
         "{{ down(5) }}", messages=msgs)
    case("generation_block",
         "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
         "[{{ m.content }}]{% endgeneration %}{% else %}<{{ m.role }}>{% endif %}{% endfor %}",
         messages=msgs)

    # -- expressions
    case("literals",
         "{{ 'single' }}|{{ \"double\" }}|{{ 'it\\'s' }}|{{ \"say \\\"hi\\\"\" }}|"
         "{{ 'a\\nb' }}|{{ 'tab\\there' }}|{{ 'back\\\\slash' }}|{{ 42 }}|{{ -7 }}|{{ 3.25 }}|"
         "{{ true }}|{{ True }}|{{ false }}|{{ False }}|{{ none }}|{{ None }}|[{{ '' }}]",
         messages=msgs)
    case("print_containers",
         "{{ [1, 'a', none, true] }}|{{ {'a': 1, 'b': 'x'} }}|{{ (1, 'two') }}|{{ (5,) }}|"
         "{{ [] }}|{{ {} }}|{{ [[1, 2], {'k': [false, 2.5]}] }}|{{ x }}", messages=msgs,
         x={"name": "Zoë", "tags": ["a", "b"], "n": None, "f": 0.5})
    case("print_string_repr_in_list",
         "{{ [\"it's\", 'a\"b', 'x\\ny', 'tab\\t', 'é✓中', 'back\\\\slash'] }}", messages=msgs)
    case("print_float_repr",
         "{{ 7 / 2 }} {{ 4 / 2 }} {{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 2.5 * 4 }} {{ 1.0 }} "
         "{{ 100.0 }} {{ 0.5 - 1 }} {{ 3 * 0.1 }} {{ temp }} {{ temp * 2 }}",
         messages=msgs, temp=0.7)
    case("print_float_repr_exponents",
         "{{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1.5e-7 }}",
         messages=msgs)
    case("attr_vs_item_access",
         "{{ messages[0].role }}|{{ messages[0]['role'] }}|{{ messages[1]['content'][:5] }}|"
         "{{ messages[-1].role }}|{{ cfg.inner.value }}|{{ cfg['inner']['value'] }}|"
         "{{ cfg.list[1] }}|{% set key = 'inner' %}{{ cfg[key].value }}", messages=msgs,
         cfg={"inner": {"value": "deep"}, "list": [10, 20]})
    case("missing_key_undefined",
         "[{{ messages[0].missing }}][{{ cfg.nope }}][{{ messages[99] }}][{{ 'ab'[7] }}]"
         "[{{ messages[0].missing is defined }}][{{ cfg.nope is undefined }}]"
         "[{{ cfg.nope | default('fallback') }}][{{ not_passed }}][{{ not_passed | length }}]"
         "{% for x in not_passed %}never{% endfor %}[{{ 'yes' if not cfg.nope else 'no' }}]",
         messages=msgs, cfg={"a": 1})
    case("slices_lists",
         "{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[1:4:2] }} "
         "{{ xs[-2:] }} {{ xs[10:] }} {{ xs[:0] }} {{ messages[1:] | length }} "
         "{{ (messages[::-1] | first).role }}", messages=msgs, xs=[0, 1, 2, 3, 4, 5])
    case("slices_strings_unicode",
         "{{ s[1:] }}|{{ s[:-1] }}|{{ s[::-1] }}|{{ s[::2] }}|{{ s[6:11] }}|{{ s[-1] }}|"
         "{{ s | length }}|{{ cjk[1:3] }}|{{ emoji[::-1] }}", messages=msgs,
         s="héllo wörld ✓", cjk="日本語テキスト", emoji="a😊b🐈c")
    case("in_not_in",
         "{{ 'ell' in 'hello' }} {{ 'x' not in 'hello' }} {{ 2 in [1, 2] }} "
         "{{ 'b' not in ['a'] }} {{ 'role' in messages[0] }} {{ 'x' in {'x': 1} }} "
         "{{ 1 in {'x': 1} }} {{ '' in 'abc' }} {{ 'é' in 'café' }}", messages=msgs)
    case("comparisons",
         "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 3 >= 4 }} {{ 1 == 1.0 }} {{ 1 != 1 }} "
         "{{ 'a' < 'b' }} {{ 'B' < 'a' }} {{ [1, 2] == [1, 2] }} {{ none == none }} "
         "{{ 'x' == 'x' }} {{ {'a': 1} == {'a': 1} }} {{ true == 1 }}", messages=msgs)
    case("logic_operators",
         "[{{ '' or 'fallback' }}][{{ 'first' or 'second' }}][{{ 0 and 'x' }}]"
         "[{{ 1 and 'x' }}][{{ none or [] }}][{{ not none }}][{{ not 'a' }}]"
         "[{{ true and not false }}][{{ false or false }}][{{ (1 or 2) + 10 }}]"
         "[{{ messages and messages[0].role }}][{{ [] or 'empty list is false' }}]",
         messages=msgs)
    case("arithmetic",
         "{{ 1 + 2 }} {{ 7 - 10 }} {{ 6 * 7 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} "
         "{{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 // 2 }} {{ 7.5 % 2 }} {{ 1 + 0.5 }} "
         "{{ 2 * 1.5 }} {{ -(3) }} {{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 10 - 2 - 3 }} "
         "{{ messages | length - 1 }}", messages=msgs)
    case("string_concat",
         "{{ 'a' + 'b' }}|{{ 'n=' ~ 3 }}|{{ 'f=' ~ 2.5 }}|{{ 'v=' ~ none }}|{{ 'b=' ~ true }}"
         "|{{ 1 ~ 2 }}|{{ [1] + [2, 3] }}|{{ 'x' ~ [1] }}|{{ 'é' + '✓' ~ '中' }}",
         messages=msgs)
    case("conditional_expression",
         "{{ 'yes' if flag else 'no' }}|{{ 'yes' if not flag else 'no' }}|"
         "[{{ 'only if' if false }}]|{{ (1 if flag else 2) + 10 }}|"
         "{{ 'a' if n > 5 else 'b' if n > 1 else 'c' }}", messages=msgs, flag=True, n=3)

    # -- filters
    case("filters_strings",
         "[{{ '  pad  ' | trim }}][{{ 'abc' | upper }}][{{ 'ÀBC' | lower }}]"
         "[{{ 'hello wide world' | title }}][{{ 'hELLO there' | capitalize }}]"
         "[{{ 'a-b-a' | replace('a', 'x') }}][{{ 'aaa' | replace('a', 'b', 2) }}]"
         "[{{ 'ab' | length }}][{{ 'héllo' | count }}][{{ '\\n x \\t' | trim }}]"
         "[{{ 'xxhixx' | trim('x') }}][{{ 42 | string }}][{{ none | string }}]",
         messages=msgs)
    case("filters_default",
         "[{{ missing | default('d1') }}][{{ missing | d('d2') }}][{{ '' | default('d3') }}]"
         "[{{ '' | default('d4', true) }}][{{ none | default('d5') }}]"
         "[{{ none | default('d6', true) }}][{{ 0 | default('d7', true) }}]"
         "[{{ 'set' | default('d8') }}][{{ cfg.x | default(cfg.y) | default('d9') }}]",
         messages=msgs, cfg={"y": None})
    case("filters_sequences",
         "{{ xs | first }} {{ xs | last }} {{ xs | length }} {{ xs | count }} "
         "{{ xs | join }} {{ xs | join(', ') }} {{ 'abc' | first }} {{ 'abc' | last }} "
         "{{ xs | reverse | list }} {{ 'abc' | reverse }} {{ 'abc' | list }} "
         "{{ xs | min }} {{ xs | max }} {{ xs | sum }} {{ [1.5, 2] | sum }} "
         "{{ [3, -4] | map('abs') | list }} {{ -2.5 | abs }} {{ [1, 1, 2, 1] | unique | list }}",
         messages=msgs, xs=[3, 1, 2])
    case("filters_sort",
         "{{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} "
         "{{ ['b', 'a', 'C'] | sort }} {{ ['b', 'a', 'C'] | sort(case_sensitive=true) }} "
         "{{ ['x', 'X', 'y', 'x'] | unique | list }} "
         "{{ people | sort(attribute='age') | map(attribute='name') | join(',') }} "
         "{{ people | sort(attribute='name', reverse=true) | map(attribute='name') | join(',') }}",
         messages=msgs, people=[{"name": "Ana", "age": 31}, {"name": "Bo", "age": 25},
                                {"name": "Cy", "age": 40}])
    case("filters_map_join",
         "{{ messages | map(attribute='role') | join('>') }}|"
         "{{ ['a', 'b'] | map('upper') | join }}|{{ people | join(', ', attribute='name') }}|"
         "{{ people | join(attribute='name') }}|"
         "{{ [1, 2.5, none] | map('string') | list }}|{{ ['3', '4'] | map('int') | sum }}",
         messages=msgs, people=[{"name": "Ana"}, {"name": "Bo"}])
    case("filters_select_reject",
         "{{ mixed | select('string') | list }} {{ mixed | reject('string') | list }} "
         "{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} "
         "{{ [0, 1, '', 'a', none] | select | list }} "
         "{{ [3, 6, 7] | select('divisibleby', 3) | list }}",
         messages=msgs, mixed=["a", 1, "b", None, 2.5])
    case("filters_selectattr",
         "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|"
         "{{ messages | rejectattr('role', 'eq', 'system') | map(attribute='role') | join(',') }}|"
         "{{ items | selectattr('on') | map(attribute='id') | join(',') }}|"
         "{{ items | rejectattr('on') | map(attribute='id') | join(',') }}|"
         "{{ (messages | selectattr('role', 'equalto', 'assistant') | first).content }}|"
         "{{ items | selectattr('tag', 'defined') | map(attribute='tag') | list }}",
         messages=msgs, items=[{"id": 1, "on": True, "tag": "x"}, {"id": 2, "on": False},
                               {"id": 3, "on": True}])
    case("filters_items_list",
         "{% for k, v in d | items %}{{ k }}:{{ v }} {% endfor %}|{{ d | list }}|"
         "{{ d.items() | list }}|{{ 'ab' | list }}|{{ range(3) | list }}",
         messages=msgs, d={"b": 1, "a": [2]})
    case("filters_numbers",
         "{{ '42' | int }} {{ '3.9' | float }} {{ 3.9 | int }} {{ -3.9 | int }} {{ 'x' | int }} "
         "{{ 'x' | float }} {{ 2 | float }} {{ '7' | int + 1 }} {{ true | int }} "
         "{{ 10 | string ~ '!' }} {{ ' 12 ' | int }}", messages=msgs)
    case("filters_tojson",
         "{{ data | tojson }}\n{{ data | tojson(indent=2) }}\n{{ 'é\"\\n' | tojson }}\n"
         "{{ [1.0, 2.5, -0.125, 10] | tojson }}\n{{ none | tojson }} {{ true | tojson }}"
         " {{ 'plain' | tojson }} {{ {} | tojson }} {{ [] | tojson(indent=2) }}\n"
         "{{ data.nested | tojson }}",
         messages=msgs,
         data={"name": "Zoë \"quoted\"", "text": "line1\nline2\ttab", "cjk": "中文 😊",
               "int": 3, "float": 0.1, "whole": 2.0, "ok": True, "nothing": None,
               "nested": {"list": [1, "two", [3.5, False]], "empty": {}}})
    case("filters_tojson_options",
         "{{ data | tojson(separators=(',', ':')) }}\n{{ data | tojson(sort_keys=true) }}\n"
         "{{ data | tojson(indent=1, sort_keys=true) }}\n{{ 'é' | tojson(ensure_ascii=true) }}",
         messages=msgs, data={"b": 1, "a": [2, 3], "c": {"z": 0, "y": 1}})
    case("filters_safe_indent",
         "{{ '<b>&</b>' | safe }}|{{ text | indent }}|{{ text | indent(2) }}|"
         "{{ text | indent(4, true) }}|{{ 'one line' | indent(4, true) }}", messages=msgs,
         text="first\nsecond\n\nfourth")

    # -- tests
    case("tests_types",
         "{% for v in values %}{{ v is string }}{{ v is number }}{{ v is integer }}"
         "{{ v is float }}{{ v is boolean }}{{ v is mapping }}{{ v is iterable }}"
         "{{ v is sequence }}{{ v is none }}\n{% endfor %}",
         messages=msgs, values=["s", 1, 1.5, True, None, [1], {"a": 1}])
    case("tests_values",
         "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} "
         "{{ 3 is odd }} {{ 3 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} "
         "{{ 1 is eq 1 }} {{ 'a' is equalto 'a' }} {{ 1 is ne 2 }} {{ 2 is in [1, 2] }} "
         "{{ 'x' is in 'xyz' }} {{ 3 is not odd }} {{ none is not none }} "
         "{{ cfg is defined }} {{ cfg.k is undefined }} {{ cfg.k is not defined }}",
         messages=msgs, cfg={})

    # -- methods
    case("string_methods_strip_split",
         "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ 'xxhixx'.strip('x') }}]"
         "[{{ '--a--'.lstrip('-') }}][{{ '\\n\\na\\n\\n'.rstrip('\\n') }}]"
         "[{{ 'ab'.strip('ba') }}]{{ s.split() }}{{ 'a,b,,c'.split(',') }}"
         "{{ 'k=v=w'.split('=', 1) }}{{ ''.split() }}{{ ''.split(',') }}"
         "{{ 'a<sep>b'.split('<sep>')[-1] }}{{ 'line1\\nline2\\r\\nline3\\n'.splitlines() }}",
         messages=msgs, s="  \tsome  spaced\n words \n")
    case("string_methods_search",
         "{{ s.startswith('<tool') }} {{ s.endswith('>') }} {{ s.endswith(('x', '>')) }} "
         "{{ s.startswith(('a', 'b')) }} {{ s.find('resp') }} {{ s.find('zz') }} "
         "{{ s.count('o') }} {{ 'é✓é'.count('é') }} {{ 'é✓é'.find('✓') }}",
         messages=msgs, s="<tool_response>ok</tool_response>")
    case("string_methods_case_replace",
         "{{ s.upper() }}|{{ s.lower() }}|{{ s.title() }}|{{ s.capitalize() }}|"
         "{{ s.replace('o', '0') }}|{{ s.replace('o', '0', 1) }}",
         messages=msgs, s="hello wOrld, ÉCOLE")
    case("dict_methods",
         "{% for k, v in d.items() %}{{ k }}={{ v }} {% endfor %}|{{ d.keys() | list }}|"
         "{{ d.values() | list }}|{{ d.get('a') }}|{{ d.get('zz') }}|{{ d.get('zz', 'dflt') }}|"
         "{% for k in d %}{{ k }}{% endfor %}|{{ d | length }}",
         messages=msgs, d={"c": 3, "a": 1, "b": None})

    # -- globals
    case("global_namespace",
         "{% set ns = namespace(count=0, names=[], found=none) %}"
         "{% for m in messages %}{% set ns.count = ns.count + 1 %}"
         "{% set ns.names = ns.names + [m.role] %}"
         "{% if m.role == 'assistant' and ns.found is none %}{% set ns.found = loop.index0 %}"
         "{% endif %}{% endfor %}{{ ns.count }} {{ ns.names }} {{ ns.found }} {{ ns.missing }}",
         messages=msgs)
    case("global_range",
         "{{ range(4) | list }} {{ range(2, 5) | list }} {{ range(10, 0, -3) | list }} "
         "{{ range(0) | list }} {% for i in range(1, 4) %}{{ i }}{% endfor %} "
         "{{ range(3) | length }}", messages=msgs)
    case("global_dict",
         "{{ dict(a=1, b='two') }} {{ dict(a=1).a }} {% set d = dict(role='user', x=[1]) %}"
         "{{ d.role }} {{ d | tojson }}", messages=msgs)
    case("global_raise_exception",
         "{% if messages | length > 2 %}{{ raise_exception('Too many messages: ' ~ "
         "messages | length) }}{% endif %}ok", messages=msgs,
         error="raised: Too many messages: 4")
    case("global_raise_exception_not_reached",
         "{% if messages | length > 9 %}{{ raise_exception('unreachable') }}{% endif %}ok",
         messages=msgs)

    # -- errors
    case("error_unclosed_if", "{% if true %}never closed", messages=msgs, error="syntax")
    case("error_unknown_tag", "{% foo %}", messages=msgs, error="syntax")
    case("error_unknown_filter", "{{ messages | nosuchfilter }}", messages=msgs,
         error="syntax")
    case("error_unknown_test", "{{ messages is nosuchtest }}", messages=msgs, error="syntax")
    case("error_unclosed_expression", "{{ 'a' + }}", messages=msgs, error="syntax")
    case("error_endfor_mismatch", "{% for m in messages %}{% endif %}", messages=msgs,
         error="syntax")
    case("error_attribute_of_undefined", "{{ nothing.attr }}", messages=msgs,
         error="undefined")
    case("error_undefined_item_chain", "{{ messages[0].missing.deeper }}", messages=msgs,
         error="undefined")
    case("error_call_undefined_function", "{{ no_such_function('x') }}", messages=msgs,
         error="undefined")
    case("error_type_add_int_str", "{{ 1 + 'a' }}", messages=msgs, error="type")
    case("error_type_add_none", "{{ messages[0].content + none }}", messages=msgs,
         error="type")
    # Corners found in review (each checked here against Jinja itself).
    case("compare_chained", "{{ 3 > 2 > 1 }} {{ 1 < 3 < 2 }} {{ 1 == 1 != 2 }} {{ 'a' in 'abc' in ['abc'] }}")
    case("tojson_positional_is_ensure_ascii", "{{ {'a': 'é'} | tojson(true) }}")
    case("round_python", "{{ 2.5 | round }} {{ 3.5 | round }} {{ 3 | round }} {{ 0.125 | round(2) }} "
         "{{ 2.675 | round(2) }} {{ 1.5 | round(0, 'floor') }} {{ 1.2 | round(0, 'ceil') }}")
    case("block_plus_keeps_newline", "{% if true +%}\nx{% endif %}\n{% if true %}\ny{% endif %}")
    case("attribute_integer_chain", "{% set x = [[1, [5, 2]]] %}{{ x.0.1 }} {{ x.0.1.0 }}")
    case("string_escapes", "{{ 'a\\tb\\x41\\101\\u00e9\\U0001F600' }}|{{ ['\\b', '\\f', '\\v'] }}")
    case("is_lower_needs_a_letter", "{{ '123' is lower }} {{ 'abc1' is lower }} {{ 'ABC' is upper }} "
         "{{ '' is upper }}")
    case("repr_non_printable", "{{ ['a\\xa0b', 'c\\x7fd', 'e\\u200bf', 'g\\x00'] }}")
    case("float_floor_division", "{{ 1 // 0.1 }} {{ 1 % 0.1 }} {{ -7.5 // 2 }} {{ 7.5 % -2 }} "
         "{{ -0.0 // 1 }}")
    case("macro_sees_loop_variables",
         "{% for y in [1, 2] %}{% macro m() %}[{{ y }}]{% endmacro %}{{ m() }}{% endfor %}")
    case("power_and_big_exponents", "{{ 2 ** 10 }} {{ 1 ** 9223372036854775807 }} "
         "{{ (-1) ** 9223372036854775807 }} {{ 0 ** 5 }} {{ 2 ** -1 }}")
    case("slice_with_huge_step", "{{ 'abc'[1::9223372036854775807] }} {{ [1, 2, 3][::-9223372036854775807] }}")
    case("empty_string_repetition", "[{{ '' * 9223372036854775807 }}][{{ 'ab' * 0 }}][{{ 'ab' * -3 }}]")
    case("map_attribute_huge_index", "{{ [[1]] | map(attribute='99999999999999999999') | list | length }}")
    case("newline_kinds", "a\r\nb\rc\x0bd\n")
    case("unknown_filter_in_untaken_if", "{% if false %}{{ x | from_json }}{% endif %}"
         "{% if true %}{% else %}{{ 1 is nosuchtest }}{% endif %}{{ 1 if true else (2 | nope) }}ok")
    case("unknown_filter_in_taken_if", "{% if true %}{{ 1 | nosuch }}{% endif %}", error="type")
    case("unknown_filter_in_loop_inside_if",
         "{% if false %}{% for a in [1] %}{{ a | nosuch }}{% endfor %}{% endif %}", error="syntax")
    case("filter_dictsort", "{% set d = {'b': 2, 'A': 3, 'c': 1} %}{{ d | dictsort }} "
         "{{ d | dictsort(true) }} {{ d | dictsort(by='value') }} {{ d | dictsort(reverse=true) }}")
    case("str_format", "{{ '<{}|{}>'.format('a', 1) }} {{ '{1}{0}{{x}}'.format('a', 'b') }} "
         "{{ '{name}!'.format(name='n') }}")
    case("dict_integer_keys", "{% set d = {2048: 512, 0: 0, 512: 128} %}{{ d[512] }} {{ d | dictsort }} "
         "{{ d.items() | list }} {{ 0 in d }} {{ d | length }} {{ d }} {{ d | tojson }} "
         "{{ d.get(2048) }} {{ d[7] is defined }}")
    case("safe_markup_concat", "{{ 'a<'|safe + '<b> & \"c\"' }} {{ \"<x>'\" + 'y'|safe }} "
         "{{ ('a'|safe + '&') ~ '<' }} {{ 'p' ~ '<'|safe }} {{ ('<'|safe) | length }}")
    case("review_edges", "{{ 15 | round(-1) }} {{ 25 | round(-1) }} {{ -15 | round(-1) }} "
         "{{ ' 1_0 ' | int }} {{ (-9223372036854775807 - 1) % 3 }} {{ 9223372036854775807 % -2 }} "
         "{{ -7 // 2 }} {{ 7 % -3 }}")
    case("macro_reads_variables_when_called",
         "{% for v in [1, 2] %}{% macro m() %}{{ v }}{% endmacro %}{% set v = 9 %}{{ m() }}"
         "{% endfor %}")
    case("select_on_none", "{{ none | selectattr('type', 'equalto', 'x') | list }} "
         "{{ none | rejectattr('x') | list | length }} {{ none | map(attribute='x') | list }}")
    # The immutable sandbox forbids mutating lists and dicts from a template.
    case("error_list_append_sandboxed",
         "{% set lst = [] %}{% for m in messages %}{% set _ = lst.append(m.role) %}"
         "{% endfor %}{{ lst }}", messages=msgs, error="type")


# ---------------------------------------------------------------- rendering
def classify(exc: Exception) -> str:
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return "syntax"
    if isinstance(exc, jinja2.UndefinedError):
        return "undefined"
    if type(exc) is jinja2.TemplateError:  # what raise_exception throws
        return f"raised: {exc.message}"
    if isinstance(exc, (TypeError, jinja2.sandbox.SecurityError, jinja2.TemplateRuntimeError)):
        return "type"
    raise AssertionError(f"unexpected error kind {type(exc).__name__}: {exc}")


def render(c: dict[str, Any]) -> None:
    context = json.loads(json.dumps(c["context"]))  # exactly what the C++ side reads
    want_error = c.get("error")
    try:
        out = _compile_jinja_template(c["template"]).render(**context)
    except Exception as exc:  # noqa: BLE001
        got = classify(exc)
        if got != want_error:
            raise AssertionError(f"{c['name']}: expected {want_error or 'success'}, got {got}")
        return
    if want_error is not None:
        raise AssertionError(f"{c['name']}: expected error {want_error!r}, rendered {out!r}")
    if re.search(r" at 0x[0-9a-f]+>", out):
        raise AssertionError(f"{c['name']}: output depends on object addresses: {out!r}")
    c["expected"] = out


def main() -> int:
    add_smollm2_cases()
    add_realistic_cases()
    add_focused_cases()
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names)), "duplicate case names"
    assert all(re.fullmatch(r"[a-z0-9_]+", n) for n in names), names
    for c in CASES:
        render(c)
    write_json(OUT, {
        "producer": (f"{GENERATOR} with transformers {pkg_version('transformers')}, "
                     f"jinja2 {pkg_version('jinja2')}"),
        "generator": GENERATOR,
        "transformers": pkg_version("transformers"),
        "jinja2": pkg_version("jinja2"),
        "cases": CASES,
    })
    n_err = sum("error" in c for c in CASES)
    print(f"wrote {rel(OUT)}: {len(CASES)} cases ({n_err} error cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
