-- Drives tensor-clangd from Neovim's built-in LSP client (0.7 API), headless:
--   TT_CLANGD=<server> TT_ROOT=<project> TT_STEPS=<steps> nvim --headless --clean -c 'luafile nvim_lsp.lua'
-- TT_STEPS is a ';'-separated list, run in order:
--   open:<file>          open <file> (relative to TT_ROOT), print its diagnostics
--   fix:<file>:<code>[@<word>]  ask for the quick fixes of <file>'s first <code>
--                        diagnostic, apply the first (or the first whose title has
--                        <word>), print the edited line and the new diagnostics
--   hover:<file>:<l>:<c> print the first line of clangd's hover at line l, column c
-- Prints one line per fact (DIAG/NOTE/ACTION/LINE) on stdout; exits 1 on any error.
local timeout = tonumber(os.getenv('TT_TIMEOUT_MS') or '120000')
local root = assert(os.getenv('TT_ROOT'), 'TT_ROOT not set')
local published = {} -- uri -> {version=, diagnostics=} of the last publishDiagnostics

local function out(line)
  io.stdout:write(line .. '\n')
end

local function start()
  local id = vim.lsp.start_client({
    name = 'tensor-clangd',
    cmd = { assert(os.getenv('TT_CLANGD'), 'TT_CLANGD not set'), '--background-index=false',
            '--log=error' },
    root_dir = root,
    flags = { debounce_text_changes = 0 },
    handlers = {
      ['textDocument/publishDiagnostics'] = function(_, result)
        published[result.uri] = { version = result.version, diagnostics = result.diagnostics }
      end,
    },
  })
  return assert(vim.lsp.get_client_by_id(id), 'the server did not start')
end

-- Waits for diagnostics of the buffer's current version: clangd also publishes
-- for other URIs (.clangd files), so everything is looked up by URI.
local function diagnostics(bufnr)
  local uri = vim.uri_from_bufnr(bufnr)
  local ok = vim.wait(timeout, function()
    local p = published[uri]
    return p ~= nil and p.version == vim.lsp.util.buf_versions[bufnr]
  end, 20)
  assert(ok, 'no diagnostics for ' .. uri)
  return published[uri].diagnostics
end

local severities = { 'error', 'warning', 'info', 'hint' }
local function where(file, range)
  return string.format('%s:%d:%d-%d:%d', file, range.start.line + 1, range.start.character + 1,
                       range['end'].line + 1, range['end'].character + 1)
end

-- DIAG <file>:<range> <severity> [<code>] <message>, then LINK <doc link>
-- (codeDescription) and NOTE lines (notes arrive as relatedInformation:
-- Neovim announces support for it).
local function print_diagnostics(file, diags)
  table.sort(diags, function(a, b)
    return a.range.start.line < b.range.start.line
  end)
  for _, d in ipairs(diags) do
    out(string.format('DIAG %s %s [%s] %s', where(file, d.range), severities[d.severity] or '?',
                      tostring(d.code), d.message))
    if d.codeDescription then
      local href = d.codeDescription.href
      local missing = href:match('^file://') and vim.fn.filereadable(vim.uri_to_fname(href)) == 0
      out('LINK ' .. href .. (missing and ' (no such file)' or ''))
    end
    for _, r in ipairs(d.relatedInformation or {}) do
      local path = vim.uri_to_fname(r.location.uri):sub(#root + 2)
      out(string.format('NOTE %s %s', where(path, r.location.range), r.message))
    end
  end
  out('END ' .. file)
end

local buffers = {}
local function open(client, file)
  vim.cmd('edit ' .. vim.fn.fnameescape(root .. '/' .. file))
  local bufnr = vim.api.nvim_get_current_buf()
  assert(vim.lsp.buf_attach_client(bufnr, client.id))
  buffers[file] = bufnr
  print_diagnostics(file, diagnostics(bufnr))
end

local function fix(client, file, code, word)
  local bufnr = assert(buffers[file], file .. ' is not open')
  local target
  for _, d in ipairs(diagnostics(bufnr)) do
    if d.code == code then
      target = target or d
    end
  end
  assert(target, 'no ' .. code .. ' diagnostic in ' .. file)
  local reply = client.request_sync('textDocument/codeAction', {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    range = target.range,
    context = { diagnostics = { target }, only = { 'quickfix' } },
  }, timeout, bufnr)
  assert(reply and not reply.err and reply.result and #reply.result > 0, 'no quick fix')
  for _, action in ipairs(reply.result) do
    out('ACTION ' .. action.title)
  end
  local chosen = reply.result[1]
  if word then
    chosen = nil
    for _, action in ipairs(reply.result) do
      if not chosen and action.title:find(word, 1, true) then
        chosen = action
      end
    end
    assert(chosen, 'no quick fix titled with ' .. word)
  end
  vim.lsp.util.apply_workspace_edit(chosen.edit, client.offset_encoding)
  local line = target.range.start.line
  out(string.format('LINE %d: %s', line + 1, vim.trim(vim.api.nvim_buf_get_lines(bufnr, line, line + 1, true)[1])))
  print_diagnostics(file, diagnostics(bufnr))
end

-- clangd's other features stay: one of them.
local function hover(client, file, line, col)
  local bufnr = assert(buffers[file], file .. ' is not open')
  local reply = client.request_sync('textDocument/hover', {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    position = { line = line - 1, character = col - 1 },
  }, timeout, bufnr)
  assert(reply and not reply.err and reply.result, 'no hover')
  local lines = vim.lsp.util.convert_input_to_markdown_lines(reply.result.contents)
  out('HOVER ' .. (lines[1] or ''))
end

local function main()
  local client = start()
  for step in string.gmatch(os.getenv('TT_STEPS') or '', '[^;]+') do
    local kind, rest = step:match('^(%w+):(.*)$')
    if kind == 'open' then
      open(client, rest)
    elseif kind == 'fix' then
      local file, code, word = rest:match('^(.*):([%w-]+)@(.+)$')
      if not file then
        file, code = rest:match('^(.*):([%w-]+)$')
      end
      fix(client, file, code, word)
    elseif kind == 'hover' then
      local file, line, col = rest:match('^(.*):(%d+):(%d+)$')
      hover(client, file, tonumber(line), tonumber(col))
    else
      error('unknown step ' .. step)
    end
  end
  client.stop()
  vim.wait(5000, function()
    return client.is_stopped()
  end, 20)
end

local ok, err = pcall(main)
if not ok then
  io.stderr:write('nvim_lsp.lua: ' .. tostring(err) .. '\n')
  vim.cmd('cquit 1')
end
vim.cmd('qall!')
